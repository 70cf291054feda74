"""root"""
